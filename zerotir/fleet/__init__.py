"""The rollout fleet: engines in processes of their own, and how the trainer's weights reach them."""
