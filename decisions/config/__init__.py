"""The stack config contract: the typed model of every `gpu-cloud:` key, its validation (every mistake at once, by key
path), the deployer's identity and the preflight of what AWS would refuse."""
