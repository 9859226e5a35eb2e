"""What the program builds from, as data with sources and dates: GPU instance types, Helm chart and EKS add-on pins, and
Kubernetes versions' support dates, each with its loader."""
