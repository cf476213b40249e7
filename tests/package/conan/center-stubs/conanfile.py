"""Stand-ins for Conan Center's boost, fmt, xsimd and openssl, for the
package.conan_center_stubs test (Conan Center is out of reach here): each declares the
CMake names and targets its Center recipe declares (Boost / Boost::headers, fmt / fmt::fmt,
xsimd / xsimd, OpenSSL / OpenSSL::Crypto and OpenSSL::SSL) and points
at Debian's files through symbolic links, so CMakeDeps generates configs and targets as it
does for the real packages.
    conan export tests/package/conan/center-stubs --name fmt --version 9.1.0"""
import os

from conan import ConanFile
from conan.errors import ConanException

# name: ({path in the package: Debian's file}, cmake_file_name, cmake_target_name,
#        {component: (its cmake_target_name, its libs)}, libs)
LIB = "/usr/lib/x86_64-linux-gnu"
STUBS = {
    "boost": ({"include/boost": "/usr/include/boost"}, "Boost", "Boost::boost", {"headers": ("Boost::headers", [])},
              []),
    "fmt": ({"include/fmt": "/usr/include/fmt", "lib/libfmt.so": f"{LIB}/libfmt.so"}, "fmt", "fmt::fmt", {}, ["fmt"]),
    "xsimd": ({"include/xsimd": "/usr/include/xsimd"}, "xsimd", "xsimd", {}, []),
    # Debian splits OpenSSL's headers: <openssl/configuration.h> lies in the multiarch folder.
    "openssl": ({"include/openssl": "/usr/include/openssl",
                 "include/x86_64-linux-gnu/openssl": "/usr/include/x86_64-linux-gnu/openssl",
                 "lib/libcrypto.so": f"{LIB}/libcrypto.so", "lib/libssl.so": f"{LIB}/libssl.so"},
                "OpenSSL", "OpenSSL::OpenSSL",
                {"crypto": ("OpenSSL::Crypto", ["crypto"]), "ssl": ("OpenSSL::SSL", ["ssl"])}, []),
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
        for component, (component_target, component_libs) in components.items():
            info = self.cpp_info.components[component]
            info.set_property("cmake_target_name", component_target)
            info.bindirs = []
            info.libs = component_libs
            if component_libs:
                info.includedirs = ["include", "include/x86_64-linux-gnu"]
            else:
                info.libdirs = []
        if "ssl" in components:
            self.cpp_info.components["ssl"].requires = ["crypto"]
