# plots/figure.gp: one figure of one or two panels, each a set of lines read from .dat
# files that plots/plots.sh extracted from the CSVs. Every PNG in plots/ is drawn by it:
#   gnuplot -e "out='plots/x.png'; dat='/tmp/...'; prefix0='tf_forward_d128_c0'; ..." plots/figure.gp
#
# Set by plots/plots.sh:
#   term        pngcairo or png (whichever this gnuplot has)
#   out, heading, ylabel          file, figure title, y axis label
#   yformat     tic format of the y axis ('%g'; '%.0b %BB' for bytes)
#   yfactor     0: y tics at 1, 2, 5 x powers of 10; else at powers of this (32 for bytes: 1 MiB,
#               32 MiB, 1 GiB; 2 for ratios: 0.5, 1, 2, 4)
#   hline, hlabel                 a horizontal reference line (0: none) and its label
#   panels      1 or 2
#   per panel p = 0, 1:
#     ptitle<p>   panel title
#     prefix<p>   the lines are dat/<prefix>__<name>.dat, two columns: N y
#     names<p>    the <name>s, in legend order (stage names: one word each)
#     lts<p>      the linetype of each name (same stage, same look in every figure)
#     marks<p>    names that have dat/<prefix>_x__<name>.dat: N y "label" for points where
#                 a stage stopped (refused or failed), drawn as a cross with its label
#     mlts<p>     the linetype of each of marks<p>
#     nlist<p>    the N values to put tics at
#   klts, ktitles   the key: linetypes and titles of every line in the figure
# dat/styles.gp holds the `set linetype` of every stage.

W = (panels == 2) ? 1600 : 1000
if (term eq 'pngcairo') {
    set terminal pngcairo size W, 600 font 'DejaVu Sans,10' noenhanced
} else {
    set terminal png size W, 600 noenhanced
}
set output out
load dat.'/styles.gp'

set grid xtics ytics mytics lc rgb '#dddddd'
set border 3
set tics nomirror
set logscale x 2
if (yfactor > 0) {
    set logscale y 2
    set ytics yfactor ** -4, yfactor
} else {
    set logscale y 10
    set ytics ()
    do for [e = -3 : 6] { set ytics add (10.0 ** e, 2 * 10.0 ** e, 5 * 10.0 ** e) }
}
set format y yformat
set xlabel 'sequence length N'
set ylabel ylabel
set autoscale yfix                      # the data's range plus a margin, not whole decades
set offsets 0, 0, graph 0.05, graph 0.05
unset key            # one key for the whole figure, drawn last at the right

# The reference line: a constant, or nothing (NaN everywhere, no key entry).
href(x) = (hline > 0) ? hline : NaN
htitle = (hline > 0) ? hlabel : ''

# N tics as 512, 1k, 2k, ... 128k; the range padded so that end points stay inside.
xlab(n) = n < 1024 ? sprintf('%d', n) : sprintf('%dk', n / 1024)

KW = (panels == 2) ? 0.16 : 0.24     # width of the key, as a fraction of the figure
PW = (1 - KW) / panels
PH = 0.94                             # leaves room for the heading
set multiplot title heading font ',13'
do for [p = 0 : panels - 1] {
    set size PW, PH
    set origin p * PW, 0
    prefix = (p == 0) ? prefix0 : prefix1
    names  = (p == 0) ? names0  : names1
    lts    = (p == 0) ? lts0    : lts1
    marks  = (p == 0) ? marks0  : marks1
    mlts   = (p == 0) ? mlts0   : mlts1
    nlist  = (p == 0) ? nlist0  : nlist1
    set title ((p == 0) ? ptitle0 : ptitle1)

    set xtics ()
    do for [w in nlist] { n = int(w); lab = xlab(n); set xtics add (lab n) }
    if (words(nlist) > 0) {
        set xrange [int(word(nlist, 1)) / 1.3 : int(word(nlist, words(nlist))) * 1.3]
    } else {
        set xrange [256 : 32768]
    }
    set yrange [*:*]

    if (words(names) == 0) {
        set label 2 'no rows for this panel' at graph 0.5, graph 0.5 center
        set yrange [1 : 10]
        plot NaN notitle
        unset label 2
    } else {
        if (words(marks) == 0) {
            plot for [i = 1 : words(names)] sprintf('%s/%s__%s.dat', dat, prefix, word(names, i)) \
                     using 1:2 with linespoints lt int(word(lts, i)) notitle, \
                 href(x) with lines dt 3 lw 1.5 lc rgb '#666666' notitle
        } else {
            plot for [i = 1 : words(names)] sprintf('%s/%s__%s.dat', dat, prefix, word(names, i)) \
                     using 1:2 with linespoints lt int(word(lts, i)) notitle, \
                 for [i = 1 : words(marks)] sprintf('%s/%s_x__%s.dat', dat, prefix, word(marks, i)) \
                     using 1:2 with points lt int(word(mlts, i)) pt 2 ps 2.5 lw 2 notitle, \
                 for [i = 1 : words(marks)] sprintf('%s/%s_x__%s.dat', dat, prefix, word(marks, i)) \
                     using 1:2:3 with labels right offset -1.2, 0.9 tc lt int(word(mlts, i)) notitle, \
                 href(x) with lines dt 3 lw 1.5 lc rgb '#666666' notitle
        }
    }
}

# The key: every line of the figure once (klts, ktitles: the union over the panels), as
# plots of nothing in an empty frame.
set size KW, PH
set origin 1 - KW, 0
unset border
unset tics
unset grid
unset xlabel
unset ylabel
unset title
unset logscale
set xrange [0 : 1]
set yrange [0 : 1]
set key inside left top vertical Left reverse samplen 3 spacing 1.3
plot for [i = 1 : words(klts)] NaN with linespoints lt int(word(klts, i)) title word(ktitles, i), \
     NaN with lines dt 3 lw 1.5 lc rgb '#666666' title htitle
unset multiplot
