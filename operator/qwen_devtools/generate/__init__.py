"""Every generated file of the repository: `python -m qwen_devtools.generate` writes them (`make generate`),
`--check` fails on a stale one (`make verify`).

files        the table of generated files, staging, the check (the entry point is __main__)
header       the "generated, do not edit" notice every generated file carries
chart_values values.yaml -> the chart's values.schema.json and README
crd_docs     the pydantic models -> docs/crd-reference.md
dashboard    the Grafana dashboard of the chart
rbac         qwen_operator.kinds.MANAGED -> the chart's child-kind RBAC rules
images       qwen_operator.versions -> images/README.md
gen_vllm_flags, image_requirements  scripts run by the Python that holds what they read (the vLLM CPU
             venv, the test venv): the flag table of vLLM's parser, the images' pinned requirements
"""
