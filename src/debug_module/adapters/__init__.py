"""Accelerator adapter interface and the mock reference implementation."""

from .base import AcceleratorAdapter, AcceleratorCapabilities
from .mock_adapter import MockAcceleratorAdapter

__all__ = ["AcceleratorAdapter", "AcceleratorCapabilities", "MockAcceleratorAdapter"]
