"""The words of the static checks: PyTorch compute ops, allow-list groups, and the calls and
names that reach the harness's process."""

from __future__ import annotations

from collections.abc import Iterable

# PyTorch compute ops by short name; the same names serve `torch.X`, `F.X`, `tensor.X()`,
# `aten::X` (runtime) and `at::X` / `torch::X` in C++ source.
COMPUTE_OPS: frozenset[str] = frozenset(
    """
    matmul mm bmm addmm addbmm baddbmm addmv mv dot vdot einsum tensordot linear bilinear
    _addmm_activation outer ger inner kron chain_matmul
    conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d convolution _convolution
    cudnn_convolution conv_tbc unfold fold
    softmax log_softmax _softmax _log_softmax softmin gumbel_softmax
    layer_norm native_layer_norm group_norm native_group_norm batch_norm native_batch_norm
    instance_norm rms_norm local_response_norm normalize
    relu relu_ relu6 gelu gelu_ silu silu_ sigmoid sigmoid_ tanh tanh_ elu elu_ selu celu leaky_relu
    leaky_relu_ hardtanh hardswish hardsigmoid mish softplus softsign logsigmoid glu prelu rrelu
    threshold tanhshrink softshrink hardshrink
    exp exp_ exp2 expm1 log log_ log2 log10 log1p sqrt sqrt_ rsqrt rsqrt_ pow pow_ square reciprocal
    sin cos tan asin acos atan atan2 sinh cosh erf erfc erfinv lgamma digamma
    sum nansum mean nanmean var std var_mean std_mean norm prod cumsum cumprod logsumexp amax amin
    argmax argmin aminmax topk kthvalue median mode
    mul mul_ div div_ sub sub_ add_ addcmul addcdiv lerp clamp clamp_ clip clip_ maximum minimum
    fmax fmin abs abs_ neg neg_ sign floor ceil round trunc frac fmod remainder where masked_fill
    scatter scatter_add index_add gather index_select take
    max_pool1d max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d
    adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool2d max_pool2d_with_indices
    interpolate upsample grid_sample pad dropout scaled_dot_product_attention
    _scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention
    multi_head_attention_forward embedding embedding_bag one_hot cross_entropy nll_loss mse_loss
    l1_loss smooth_l1_loss huber_loss kl_div binary_cross_entropy cosine_similarity pairwise_distance
    cdist triu tril flip roll sort argsort cross
    """.split()
)

# Groups an allow-list may name; each also allows the matching library's kernels at runtime.
ALLOW_GROUPS: dict[str, frozenset[str]] = {
    "gemm": frozenset(
        "matmul mm bmm addmm addbmm baddbmm addmv mv dot vdot einsum tensordot linear bilinear "
        "_addmm_activation outer inner chain_matmul cublas".split()
    ),
    "conv": frozenset(
        "conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d convolution "
        "_convolution cudnn_convolution conv_tbc cudnn".split()
    ),
}

# `torch.X(...)` calls that allocate, describe or launch rather than compute.
TORCH_ALLOWED_CALLS: frozenset[str] = frozenset(
    """
    empty empty_like empty_strided zeros zeros_like ones ones_like full full_like tensor as_tensor
    Size device dtype is_tensor numel is_floating_point is_complex result_type promote_types
    get_default_dtype no_grad inference_mode enable_grad set_grad_enabled is_grad_enabled
    """.split()
)

# `torch.cuda.X(...)` calls that change how work is scheduled (side streams) or reach libraries.
CUDA_STREAM_CALLS = frozenset({"Stream", "stream", "ExternalStream", "set_stream", "StreamContext"})
CUDA_LIBRARY_CALLS = frozenset({"current_blas_handle"})
ALLOCATOR_CALLS = frozenset(
    {"empty_cache", "caching_allocator_alloc", "caching_allocator_delete", "change_current_allocator",
     "CUDAPluggableAllocator", "_set_allocator_settings", "set_per_process_memory_fraction", "MemPool",
     "use_mem_pool"}
)

SEED_NAMES = frozenset(
    {"manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
     "set_rng_state", "get_rng_state_all", "set_rng_state_all", "Generator", "default_generator",
     "fork_rng"}
)

PRECISION_SETTERS = frozenset(
    {"set_float32_matmul_precision", "set_default_dtype", "set_default_tensor_type", "set_flush_denormal"}
)
PRECISION_FLAGS = frozenset(
    {"allow_tf32", "allow_fp16_reduced_precision_reduction", "allow_bf16_reduced_precision_reduction",
     "fp32_precision", "allow_fp16_accumulation"}
)

# Python modules whose use says the candidate is reaching into the harness's process.
INTROSPECTION = {
    "gc": frozenset({"get_objects", "get_referrers", "get_referents"}),
    "inspect": frozenset({"stack", "currentframe", "getouterframes", "getinnerframes", "trace"}),
    "sys": frozenset({"_getframe", "settrace", "setprofile", "_current_frames", "addaudithook"}),
    "threading": frozenset({"settrace", "setprofile", "settrace_all_threads", "setprofile_all_threads"}),
}
FRAME_ATTRS = frozenset({"f_back", "f_globals", "f_locals", "tb_frame", "gi_frame", "cr_frame", "f_builtins"})
CHANNEL_CALLS = {
    "os": frozenset({"write", "writev", "dup", "dup2", "fork", "forkpty", "kill", "killpg", "_exit",
                     "fdopen", "pipe", "openpty", "system", "execv", "execve", "execvp", "spawnv",
                     "posix_spawn"}),
    "sys": frozenset({"exit"}),
}
CHANNEL_MODULES = frozenset({"socket", "multiprocessing", "subprocess", "signal", "pty", "mmap", "_posixsubprocess"})
THREAD_CALLS = {
    "threading": frozenset({"Thread", "Timer"}),
    "_thread": frozenset({"start_new_thread", "start_new", "start_joinable_thread"}),
    "concurrent.futures": frozenset({"ThreadPoolExecutor", "ProcessPoolExecutor"}),
    "asyncio": frozenset({"new_event_loop", "run", "get_event_loop", "to_thread"}),
}
LIBRARY_COMPILERS = ("torch.compile", "torch.jit", "torch._dynamo", "torch._inductor", "torch.fx")
TENSOR_SUBCLASS_HOOKS = frozenset({"__torch_function__", "__torch_dispatch__"})
TENSOR_SUBCLASS_MAKERS = frozenset({"_make_subclass", "_make_wrapper_subclass", "as_subclass"})
BUILD_CALLS = frozenset({"load_inline", "load", "_compile_kernel", "compile_kernel", "_nvrtc_compile"})
LOGGING_CALLS = frozenset({"print", "warn", "debug", "info", "warning", "error", "exception", "log"})

# Attribute calls on a tensor that are PyTorch compute ops. Names that ordinary Python objects also
# have (`set.add`, `list.sort`, `dict.update`, `str.index`) are left out: static checks must not cry
# wolf, and the runtime guard sees every tensor op anyway.
TENSOR_METHODS: frozenset[str] = frozenset(
    """
    matmul mm bmm addmm addbmm baddbmm addmv mv softmax log_softmax relu relu_ sigmoid sigmoid_ tanh
    tanh_ exp exp_ log_ sqrt sqrt_ rsqrt rsqrt_ pow pow_ reciprocal erf sum nansum mean var std amax
    amin argmax argmin max min cumsum cumprod logsumexp norm clamp clamp_ clamp_min clamp_max mul mul_
    div div_ sub sub_ add_ addcmul addcdiv abs abs_ neg neg_ masked_fill masked_fill_ layer_norm
    """.split()
)


# ---------------------------------------------------------------------------------------------
# Allow-list


def expand_allow(allow: Iterable[str]) -> frozenset[str]:
    """Normalises an allow-list to short op names.

    Entries may be group names (`gemm`, `conv`), Python names (`torch.matmul`,
    `torch.nn.functional.linear`), ATen names (`aten::mm`, `aten.addmm.default`) or short names;
    `torch.matmul` and `aten::matmul` both become `matmul`, so one entry covers the static check
    and the runtime guard alike.
    """
    out: set[str] = set()
    for raw in allow:
        entry = raw.strip()
        if not entry:
            continue
        if entry.lower() in ALLOW_GROUPS:
            out |= ALLOW_GROUPS[entry.lower()]
            continue
        entry = entry.replace("::", ".")
        parts = [p for p in entry.split(".") if p]
        if parts and parts[0] == "aten" and len(parts) >= 2:
            out.add(parts[1])
        elif parts:
            out.add(parts[-1])
    return frozenset(out)


