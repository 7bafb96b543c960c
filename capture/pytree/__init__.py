"""What a call's structure is: the cache registry, pytree registrations, stored treespecs.

Shared by recording, analysis, the seed API and replay. Modules are imported by their full name
(this file imports nothing, so the store's readers load without torch).
"""
