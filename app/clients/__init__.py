"""The worked example for SaaS developers: one job and one cron (see the README, "Add a job")."""
