"""gdn_lab: does a request get the same bits whatever it is batched with, and if not, which op breaks it?"""

__version__ = "0.1.0"
