/*
 * aclnn-py: the umbrella header CANN programs include (CANN's acl/acl.h). It brings in the runtime
 * subset this project speaks: base types and status codes, devices, contexts, streams, events and
 * memory.
 */
#ifndef ACLNN_PY_ACL_H
#define ACLNN_PY_ACL_H

#include "acl/acl_base.h"
#include "acl/acl_rt.h"

#endif
