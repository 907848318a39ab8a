/*
 * aclnn-py: aclnn library lifecycle (subset of CANN's aclnn/aclnn_base.h).
 */
#ifndef ACLNN_PY_ACLNN_BASE_H
#define ACLNN_PY_ACLNN_BASE_H

#include "aclnn/acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

aclnnStatus aclnnInit(const char *configPath);
aclnnStatus aclnnFinalize(void);

#ifdef __cplusplus
}
#endif

#endif
