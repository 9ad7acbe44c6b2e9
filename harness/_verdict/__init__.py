"""The verdict model: the rules' options, findings and checks, and the saved verdict's schema."""
