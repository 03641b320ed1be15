"""One router per resource: studies (and their trials), tasks, health."""
