"""What a platform that used Perspective holds, read as rows jaxtpu learns and checks from:
its comments with Perspective's scores and its moderators' decisions (framework-free)."""
