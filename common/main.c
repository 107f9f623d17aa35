/* common/main.c: the program of one stage, compiled once per stage with
 * -DATTN_STAGE=stage_<dir> (the Makefile does it); everything else is attn_main. */
#include "harness.h"

extern const attn_stage ATTN_STAGE;

int main(int argc, char **argv) { return attn_main(&ATTN_STAGE, argc, argv); }
