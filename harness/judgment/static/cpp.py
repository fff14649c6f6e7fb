"""C++/CUDA source held in the candidate's strings, scanned with comments stripped."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from kb_mcp.harness.judgment.static.names import Context, is_docstring
from kb_mcp.harness.judgment.static.vocabulary import COMPUTE_OPS
from kb_mcp.harness.judgment.verdict import FindingCode

_CPP_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_CPP_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')
_CPP_HINTS = ("__global__", "#include", "__device__", "torch::Tensor", "at::Tensor", "extern \"C\"",
              "PYBIND11_MODULE", "TORCH_LIBRARY", "blockIdx", "threadIdx")


@dataclass(frozen=True)
class _CppRule:
    code: FindingCode
    pattern: re.Pattern[str]
    message: str
    allow_key: str | None = None  # an allow-list entry that lifts the rule


CPP_RULES: tuple[_CppRule, ...] = (
    _CppRule(
        FindingCode.library_call,
        re.compile(r"#\s*include\s*[<\"](cublas\w*|cublasLt\w*)(\.h)?[>\"]|\bcublas\w*\s*\(|\bgetCurrentCUDABlas(Lt)?Handle\b"),
        "C++ source uses cuBLAS ({match}); write the matrix product as your own kernel, or ask for "
        "the `gemm` allow-list",
        "cublas",
    ),
    _CppRule(
        FindingCode.library_call,
        re.compile(r"#\s*include\s*[<\"]cudnn\w*(\.h)?[>\"]|\bcudnn\w*\s*\(|\bgetCudnnHandle\b"),
        "C++ source uses cuDNN ({match}); write the convolution as your own kernel, or ask for the "
        "`conv` allow-list",
        "cudnn",
    ),
    _CppRule(
        FindingCode.l2_persistence,
        re.compile(
            r"\b(cudaLimitPersistingL2CacheSize|CU_LIMIT_PERSISTING_L2_CACHE_SIZE|accessPolicyWindow|"
            r"cudaAccessPropertyPersisting|CU_ACCESS_PROPERTY_PERSISTING|cudaStreamAttributeAccessPolicyWindow|"
            r"cudaLaunchAttributeAccessPolicyWindow|CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW|"
            r"cudaStreamSetAttribute|cuStreamSetAttribute|cudaCtxResetPersistingL2Cache)\b"
        ),
        "C++ source configures L2 persistence ({match}); persisting lines survive the harness's L2 "
        "flush and make timings unrepresentative: remove it",
    ),
    _CppRule(
        FindingCode.unsynchronized_work,
        re.compile(r"\b(cudaStreamCreate\w*|cuStreamCreate\w*|cudaLaunchHostFunc|cudaStreamAddCallback)\b"),
        "C++ source creates a stream or host callback ({match}); work there can escape the "
        "harness's stream timer: launch on the current stream (at::cuda::getCurrentCUDAStream())",
    ),
    _CppRule(
        FindingCode.background_thread,
        re.compile(r"\b(std::thread|std::async|pthread_create|std::jthread)\b"),
        "C++ source starts a thread ({match}); host threads can hide work from the timer: do the "
        "work inside the call",
    ),
)

_CPP_OPS = "|".join(sorted((re.escape(op) for op in COMPUTE_OPS), key=len, reverse=True))
CPP_TORCH_OP = re.compile(rf"\b(?:at|torch)::(?:native::|nn::functional::)?({_CPP_OPS})\s*\(")
CPP_TENSOR_METHOD = re.compile(rf"[\w\)\]]\s*(?:\.|->)\s*({_CPP_OPS})\s*\(")


def looks_like_cpp(text: str) -> bool:
    return any(hint in text for hint in _CPP_HINTS)


def strip_cpp_comments(text: str) -> str:
    """Replaces C/C++ comments by blanks of the same line structure, so offsets map to lines."""

    def blank(m: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    # String literals go first so that `"http://x"` is not taken for a comment.
    out: list[str] = []
    pos = 0
    for m in re.finditer(r'"(?:\\.|[^"\\\n])*"|//[^\n]*|/\*.*?\*/', text, re.S):
        out.append(text[pos : m.start()])
        out.append(m.group(0) if m.group(0).startswith('"') else blank(m))
        pos = m.end()
    out.append(text[pos:])
    return "".join(out)



def check_strings(tree: ast.Module, ctx: Context, parents: dict[ast.AST, ast.AST]) -> None:
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if is_docstring(node, parents):
            continue
        text = node.value
        lowered = text.lower()
        # Library names handed to ctypes or dlopen, in any string.
        for lib, code, label in (("cublas", FindingCode.library_call, "cublas"), ("cudnn", FindingCode.library_call,
                                                                                  "cudnn")):
            if re.search(rf"\blib{lib}\w*\.so", lowered) and label not in ctx.allow:
                ctx.add(code, node.lineno, f"line {node.lineno}: the candidate loads {lib} ('{text[:60]}'); "
                        "compute with your own kernel")
        if not looks_like_cpp(text):
            continue
        code_text = strip_cpp_comments(text)
        seen: set[tuple[FindingCode, int]] = set()
        for rule in CPP_RULES:
            if rule.allow_key and rule.allow_key in ctx.allow:
                continue
            for m in rule.pattern.finditer(code_text):
                line = node.lineno + code_text[: m.start()].count("\n")
                if (rule.code, line) in seen:
                    continue
                seen.add((rule.code, line))
                ctx.add(rule.code, line, f"line {line}: " + rule.message.format(match=m.group(0).strip()))
        for pattern, what in ((CPP_TORCH_OP, "a PyTorch op"), (CPP_TENSOR_METHOD, "a tensor method")):
            for m in pattern.finditer(code_text):
                op = m.group(1)
                if op in ctx.allow:
                    continue
                line = node.lineno + code_text[: m.start()].count("\n")
                ctx.add(
                    FindingCode.library_call,
                    line,
                    f"line {line}: C++ source calls {what} `{m.group(0).strip().rstrip('(').strip()}`; "
                    "compute it in your own kernel (torch::empty and friends are fine)",
                )

