"""The predictor (`paramedic simulate`): the core's objects driven in virtual time."""
