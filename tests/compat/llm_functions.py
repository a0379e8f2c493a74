def list_files() -> str:
    "List the files in the current directory."
    import os
    return "\n".join(os.listdir("."))

def bash(command: str) -> str:
    "Run a shell command."
    return "not allowed"
