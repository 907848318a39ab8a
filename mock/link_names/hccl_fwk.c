/* The body of libhccl_fwk.so in the mock root: it exports nothing itself and depends on the mock's
 * libhccl.so, which implements every HCCL function (link_names/README.md). */
typedef int aclnn_py_mock_hccl_fwk;
