"""Call groups, dynamic dims, shared symbols, relations and summaries, over a store's signatures.

Modules are imported by their full name.
"""
