"""Traces, utilization sampling and py-spy around trainer runs."""
