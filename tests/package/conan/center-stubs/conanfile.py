"""Stand-ins for Conan Center's boost, fmt and xsimd, for the package.conan_center_stubs
test (Conan Center is out of reach here): each declares the CMake names and targets its
Center recipe declares (Boost / Boost::headers, fmt / fmt::fmt, xsimd / xsimd) and points
at Debian's files through symbolic links, so CMakeDeps generates configs and targets as it
does for the real packages.
    conan export tests/package/conan/center-stubs --name fmt --version 9.1.0"""
import os

from conan import ConanFile
from conan.errors import ConanException

# name: ({path in the package: Debian's file}, cmake_file_name, cmake_target_name,
#        {component: its cmake_target_name}, libs)
STUBS = {
    "boost": ({"include/boost": "/usr/include/boost"}, "Boost", "Boost::boost", {"headers": "Boost::headers"}, []),
    "fmt": ({"include/fmt": "/usr/include/fmt", "lib/libfmt.so": "/usr/lib/x86_64-linux-gnu/libfmt.so"},
            "fmt", "fmt::fmt", {}, ["fmt"]),
    "xsimd": ({"include/xsimd": "/usr/include/xsimd"}, "xsimd", "xsimd", {}, []),
}


class CenterStub(ConanFile):
    settings = "os", "arch", "compiler", "build_type"

    def set_name(self):
        if self.name not in STUBS:
            raise ConanException(f"no stub for '{self.name}': pass --name, one of {', '.join(STUBS)}")

    def package_id(self):
        self.info.clear()

    def package(self):
        for inside, system in STUBS[self.name][0].items():
            link = os.path.join(self.package_folder, inside)
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(system, link)

    def package_info(self):
        _, file_name, target, components, libs = STUBS[self.name]
        self.cpp_info.set_property("cmake_file_name", file_name)
        self.cpp_info.set_property("cmake_target_name", target)
        self.cpp_info.bindirs = []
        self.cpp_info.libs = libs
        if not libs:
            self.cpp_info.libdirs = []
        for component, component_target in components.items():
            self.cpp_info.components[component].set_property("cmake_target_name", component_target)
            self.cpp_info.components[component].bindirs = []
            self.cpp_info.components[component].libdirs = []
