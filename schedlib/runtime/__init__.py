"""Running generated kernels: cupy on a GPU, the CPU emulator, and nvcc/NVRTC compile checks."""

from schedlib.runtime.kernel import Kernel, LaunchSpec, build
from schedlib.runtime.resources import CompiledResources, CompiledUsage, compiled_resources

__all__ = ["CompiledResources", "CompiledUsage", "Kernel", "LaunchSpec", "build", "compiled_resources"]
