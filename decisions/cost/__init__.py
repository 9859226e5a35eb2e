"""The bill: what a stack costs per hour, per month and over a commitment's term, with prices as data."""
