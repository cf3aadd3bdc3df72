# Finds librados and its C++ API (Debian: librados-dev, and libradospp-dev for
# rados/librados.hpp; neither ships a CMake config) and defines Rados::rados.
find_path(Rados_INCLUDE_DIR NAMES rados/librados.hpp)
find_library(Rados_LIBRARY NAMES rados)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Rados REQUIRED_VARS Rados_LIBRARY Rados_INCLUDE_DIR)
if(Rados_FOUND AND NOT TARGET Rados::rados)
  add_library(Rados::rados UNKNOWN IMPORTED)
  set_target_properties(Rados::rados PROPERTIES
    IMPORTED_LOCATION "${Rados_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${Rados_INCLUDE_DIR}")
endif()
mark_as_advanced(Rados_INCLUDE_DIR Rados_LIBRARY)
