"""`agentrun demo`: a run survives kill -9 of its worker and resumes on another, without paying twice."""
