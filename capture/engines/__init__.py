"""What the traffic tells engines downstream: optimization profiles, buckets, the HTML report.

Modules are imported by their full name.
"""
