"""The GPU operator, team tenancy, the training queue and operators, and pod hardening as typed Args."""
