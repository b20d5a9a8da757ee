"""Protocol front-ends: each translates its wire format to the core's types and back."""
