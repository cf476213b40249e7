import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy, load
from conan.tools.layout import basic_layout

required_conan_version = ">=2.0"


class QcollConan(ConanFile):
    name = "qcoll"
    description = ("Quantized collective communication for distributed training: allreduce and friends "
                   "over threads, shared memory and TCP, with 1- to 8-bit gradient quantizers")
    # The repository has no LICENSE file yet: replace with its SPDX identifier once it has one
    # (package() already copies a LICENSE* file into licenses/).
    license = "NOASSERTION"
    url = "https://github.com/conan-io/conan-center-index"
    topics = ("allreduce", "collective-communication", "quantization", "distributed-training", "simd",
              "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    # OpenSSL authenticates ranks (HMAC-SHA256) and runs TLS. Without it (with_openssl=False)
    # the headers are built with QCOLL_NO_OPENSSL: a job with a secret is refused, and says
    # so; never a silent downgrade. The package's files are the same either way.
    options = {"with_openssl": [True, False]}
    default_options = {"with_openssl": True}
    no_copy_source = True
    # No CUDA option: the CUDA backend (src/cuda_kernels.cu, target qcoll::cuda) is shipped as
    # source and compiled by the consumer's own nvcc when its project enables CUDA, taking
    # cuda_runtime.h from its own toolkit (which Conan Center does not package). The package
    # holds the same files with or without CUDA, so an option would only split package ids
    # without changing a byte.
    #
    # The quantizer kernels (src/kernels.cpp) are shipped as source and compiled in the
    # consumer's build, once per instruction set, by the CMake build module below, exactly as
    # qcoll's own installed qcollConfig.cmake does (it reuses cmake/qcollKernels.cmake). So the
    # package stays header-only and architecture independent: a prebuilt static library would
    # need settings in the package id and would fix the compiler that built the kernels.
    exports_sources = (
        "include/*",
        "src/kernels.cpp",
        "src/cuda_kernels.cu",
        "cmake/qcollKernels.cmake",
        "cmake/qcollDependencies.cmake",
        "cmake/qcollConanKernels.cmake",
        "cmake/qcollConanSystemDependencies.cmake",
        "LICENSE*",
    )

    # What qcoll's headers need besides the system's threads.
    @property
    def _dependencies(self):
        return ("boost", "fmt", "xsimd") + (("openssl",) if self.options.with_openssl else ())

    @property
    def _cmake_dir(self):
        return os.path.join("lib", "cmake", "qcoll")

    def set_version(self):
        # Defined once, in include/qcoll/version.hpp (as CMakeLists.txt reads it).
        header = load(self, os.path.join(self.recipe_folder, "include", "qcoll", "version.hpp"))
        parts = [re.search(rf"^#define QCOLL_VERSION_{part} ([0-9]+)$", header, re.MULTILINE)
                 for part in ("MAJOR", "MINOR", "PATCH")]
        self.version = self.version or ".".join(part.group(1) for part in parts)

    def layout(self):
        basic_layout(self)

    def requirements(self):
        # Asio (TCP transport, rendezvous) is header-only in Boost.
        self.requires("boost/[>=1.74 <2]")
        # fmt::fmt: the compiled library (or header-only, with fmt's own option).
        self.requires("fmt/[>=9 <13]")
        self.requires("xsimd/[>=8.1 <15]")
        if self.options.with_openssl:
            self.requires("openssl/[>=1.1.1 <4]")

    def package_id(self):
        self.info.clear()

    def _system_dependencies(self):
        """The dependencies the profile maps to the system with [platform_requires]: Conan puts
        them in no generator's output (CMakeDeps writes no config for them and leaves them out
        of qcoll::qcoll's links), so qcoll's build module finds them itself."""
        from_conan = {require.ref.name for require, _ in self.dependencies.direct_host.items()}
        return [name for name in self._dependencies if name not in from_conan]

    def validate(self):
        check_min_cppstd(self, 20)
        system = self._system_dependencies()
        if system and len(system) != len(self._dependencies):
            raise ConanInvalidConfiguration(
                f"{', '.join(self._dependencies)} must come either all from Conan or all from the system "
                f"([platform_requires]); this profile maps only {', '.join(system)} to the system")

    def package(self):
        copy(self, "LICENSE*", self.source_folder, os.path.join(self.package_folder, "licenses"))
        copy(self, "*", os.path.join(self.source_folder, "include"), os.path.join(self.package_folder, "include"))
        cmake_dir = os.path.join(self.package_folder, self._cmake_dir)
        for source in ("kernels.cpp", "cuda_kernels.cu"):
            copy(self, source, os.path.join(self.source_folder, "src"), os.path.join(cmake_dir, "src"))
        for module in ("qcollKernels.cmake", "qcollDependencies.cmake", "qcollConanKernels.cmake",
                       "qcollConanSystemDependencies.cmake"):
            copy(self, module, os.path.join(self.source_folder, "cmake"), cmake_dir)

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "qcoll")
        self.cpp_info.set_property("cmake_target_name", "qcoll::qcoll")
        # 0.x releases break compatibility between minor versions (as qcoll's own qcollConfigVersion.cmake says).
        self.cpp_info.set_property("cmake_config_version_compat", "SameMinorVersion")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.requires = ["boost::headers", "fmt::fmt", "xsimd::xsimd"]
        if self.options.with_openssl:
            self.cpp_info.requires.append("openssl::ssl")  # TLS; libcrypto comes with it
        else:
            self.cpp_info.defines = ["QCOLL_NO_OPENSSL"]
        if self.settings.os in ("Linux", "FreeBSD"):
            self.cpp_info.system_libs = ["pthread"]
        # CMakeDeps includes build modules after it has created qcoll::qcoll and found the
        # dependencies' packages (the system's, with [platform_requires], are found by the first
        # module). The kernels need target xsimd: Conan Center's xsimd names it so, as xsimd's
        # own CMake config does.
        modules = [os.path.join(self._cmake_dir, "qcollConanKernels.cmake")]
        if self._system_dependencies():
            modules.insert(0, os.path.join(self._cmake_dir, "qcollConanSystemDependencies.cmake"))
        self.cpp_info.set_property("cmake_build_modules", modules)
