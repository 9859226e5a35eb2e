"""Stack config model, validation, GPU catalog and the pure decisions made from them.

Nothing here imports Pulumi: the offline plan and the tests call it directly.
"""
