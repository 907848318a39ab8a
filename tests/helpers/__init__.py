"""Helpers shared by the operator test suites: raw phase-1 calls (moe_calls), the seeded configuration
matrix, per-rank inputs and the comparison with aclnn_py.golden (moe_cases, moe_world)."""
