"""The built-in coordinator: its settings, HTTP server, authorization, routes, protocol, task board, journal,
progress, status page, event loop and end record.
"""
