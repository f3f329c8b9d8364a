"""The coordinator's clients: workers (the protocol, one keep-alive connection, the task handlers) and the
readiness gates (their HTTP sessions).
"""
