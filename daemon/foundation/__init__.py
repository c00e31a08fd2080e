"""What every part of recoveryd may use and which uses none of them: values as users
write them, checked in one place (`durations`, `schedule`, `urls`), misspelt variables
(`variables`), how messages name things (`words`), structured logs (`logs`).
"""
