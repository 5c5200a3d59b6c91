"""Test harnesses shared by the test tiers and the benchmarks: real trainer processes on one machine."""
