"""The cpu platform: the executable specification (torch reference of every op and storage format)."""
