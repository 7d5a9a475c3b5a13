"""The test suite's infrastructure: private servers and clusters, network namespaces, child
processes' entry points, the settings and apps the child processes run with."""
