"""The flags: the schema (one field per flag), presets, config files, the resolved `RunSpec`,
the mesh a run asks for, and the command line of both sides (framework-free).
"""
