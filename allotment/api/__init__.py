"""The HTTP layer: routing, microversions, auth, policy, schemas, shaping."""
