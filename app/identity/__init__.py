"""Identity: Clerk users, organizations (our workspaces) and memberships, copied from Clerk's webhooks."""
