"""Starting and supervising programs: launch.py's container runtimes, scratch on other nodes and lifeline, the
one child supervisor, how your programs are run, your service's tunnel across nodes, naming what your programs
listen on beyond loopback.
"""
