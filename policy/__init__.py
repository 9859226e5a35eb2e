"""gpu-cloud's CrossGuard policy pack (`pulumi preview --policy-pack policy`); the policies live in policies.py."""
