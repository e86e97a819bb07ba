# Helpers that keep every layer's CMake short: a layer is a directory of sources that becomes one
# static library; its tests are one GoogleTest executable whose cases ctest sees one by one.

set(KIMIRT_WARNINGS -Wall -Wextra -Wpedantic -Wno-missing-field-initializers)
if(KIMIRT_WERROR)
  list(APPEND KIMIRT_WARNINGS -Werror)
endif()

# kimirt_layer(NAME <layer> [DEPS <targets>...] [CUDA])
# Builds src/kimirt/<layer>/*.cpp (and *.cu when CUDA) into kimirt_<layer>.
function(kimirt_layer)
  cmake_parse_arguments(ARG "CUDA" "NAME" "DEPS" ${ARGN})
  set(dir ${CMAKE_CURRENT_SOURCE_DIR}/${ARG_NAME})
  file(GLOB srcs CONFIGURE_DEPENDS ${dir}/*.cpp)
  if(ARG_CUDA)
    file(GLOB cu_srcs CONFIGURE_DEPENDS ${dir}/*.cu)
    list(APPEND srcs ${cu_srcs})
  endif()
  set(target kimirt_${ARG_NAME})
  if(NOT srcs)
    # A layer whose files have not arrived yet is still a real library, so that links and flags work.
    set(stub ${CMAKE_CURRENT_BINARY_DIR}/${target}_empty.cpp)
    file(WRITE ${stub} "// empty layer\n")
    set(srcs ${stub})
  endif()
  add_library(${target} STATIC ${srcs})
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${target} PUBLIC ${ARG_DEPS})
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KIMIRT_WARNINGS}>)
endfunction()

# kimirt_test(NAME <name> SOURCES <files>... DEPS <targets>... LABEL cpu|gpu)
function(kimirt_test)
  cmake_parse_arguments(ARG "" "NAME;LABEL" "SOURCES;DEPS" ${ARGN})
  if(NOT ARG_LABEL)
    set(ARG_LABEL cpu)
  endif()
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_options(${ARG_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KIMIRT_WARNINGS}>)
  target_compile_definitions(${ARG_NAME} PRIVATE
    KIMIRT_TESTDATA_DIR="${PROJECT_SOURCE_DIR}/testdata"
    KIMIRT_BINARY_DIR="${PROJECT_BINARY_DIR}")
  # PRE_TEST: listing the cases happens when ctest runs, not at build time, so a GPU test binary is
  # never executed on a machine that only compiles it.
  gtest_discover_tests(${ARG_NAME}
    DISCOVERY_MODE PRE_TEST
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
    PROPERTIES LABELS ${ARG_LABEL} TIMEOUT 1200)
endfunction()
