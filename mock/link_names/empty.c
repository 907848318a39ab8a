/* The body of libopapi_math.so and libopapi.so in the mock root: libraries a CANN link line names
 * whose operators the mock does not simulate (link_names/README.md). They export no function, so a
 * program that calls one of their operators fails to link instead of running a pretend operator. */
typedef int aclnn_py_mock_empty_library;
