# The Go sources libnexar.so is built from, for the build rules' DEPENDS:
# one list for the top-level CMakeLists.txt and bindings/python's. Every
# package that capi imports, directly or not, must be under one of these
# globs (go list -deps ./capi), or an edit there leaves a stale library.
# Usage: nexar_go_sources(<out-var> <repository root>)
function(nexar_go_sources out root)
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS
    "${root}/capi/*.go" "${root}/capi/*.c" "${root}/capi/*.h"
    "${root}/core/*.go" "${root}/collective/*.go" "${root}/collective/*.s"
    "${root}/transport/*.go" "${root}/membership/*.go" "${root}/topology/*.go"
    "${root}/compress/*.go" "${root}/internal/*.go" "${root}/internal/*.s"
    "${root}/hw/*.go" "${root}/hw/*.c" "${root}/hw/*.h" "${root}/hier/*.go")
  list(FILTER srcs EXCLUDE REGEX "_test\\.go$")
  list(APPEND srcs "${root}/go.mod" "${root}/go.sum")
  set(${out} ${srcs} PARENT_SCOPE)
endfunction()
