"""The process's life beside the stages: every background task under one supervisor
(`supervisor`), this replica among those sharing a store and its part of the rate
limit (`replicas`), the singleton jobs one replica runs at a time (`leadership`),
pruning on a schedule (`retention`), open descriptors against their limit
(`descriptors`). It uses the store, the client and the metrics, never a stage.
"""
