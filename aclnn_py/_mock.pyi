"""Type stub of the mock's pybind11 control module (mock/python/mock_module.cpp)."""

from typing import Any

def __getattr__(name: str) -> Any: ...
