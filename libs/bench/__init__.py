"""Benchmarks that run published scenarios through the platform."""
