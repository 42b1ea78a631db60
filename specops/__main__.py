from .report import report

print(report())
