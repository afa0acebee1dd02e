class BadInput(Exception):
    """User input that cannot be used. The message is one line naming the field and what is allowed;
    the command line prints it and exits with code 2."""
