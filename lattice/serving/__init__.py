"""Online serving: FastAPI app that scores requests with the champion model and Feast features."""
