/* The body of libop_common.so in the mock root: a library a CANN link line names whose functions the
 * mock does not simulate (link_names/README.md). It exports no function, so a program that calls one
 * fails to link instead of running a pretence. */
typedef int aclnn_py_mock_empty_library;
