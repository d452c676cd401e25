"""Running generated kernels: cupy on a GPU, the CPU emulator, and nvcc/NVRTC compile checks."""

from schedlib.runtime.kernel import Kernel, LaunchSpec, build

__all__ = ["Kernel", "LaunchSpec", "build"]
