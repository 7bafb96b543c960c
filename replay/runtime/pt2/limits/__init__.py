"""What a program may do when it runs, checked at load.

The tensors it writes and the random numbers it draws (`effects`), and the work one call may do
(`budget`).
"""
