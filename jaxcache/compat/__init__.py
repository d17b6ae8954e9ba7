"""Horovod 0.28.1 compatibility pieces shared by jaxcache.torch and jaxcache.tensorflow.

The bridges re-export these under Horovod's names; see docs/horovod.md for the table of
every Horovod name and its status in jaxcache.
"""
