// What every model kernel file's launchers share (the renderer puts this file first): a failed launch
// or call thrown as an error that names it, with CUDA's words.

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

inline void mc_check(cudaError_t err, const char* what) {
    if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}
